"""Corpus -> tokenizer -> token shards -> batches. Imports nothing from model/ or training/."""
