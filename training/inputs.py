"""What a run needs before its first step, and what it is: the prepared data and the fused kernels
(built once, also for a driver that starts runs side by side), the batch split and this node's
memory check, the model's size and FLOPs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from data.loader import BatchLoader, eval_batches, load_tokens, read_meta
from data.prepare import prepare as prepare_data
from data.sources import DataError
from data.tokenizer import Tokenizer
from fused import kernel_available, kernel_paths
from model import Llama
from model.layers import attention_path
from training import distributed, memory
from training.config import Config, ConfigError
from training.cpu import tune_cpu
from training.flops import flops_per_token, peak_flops
from training.parallel import check_layout, data_coords, split_batch


def prepare(cfg: Config) -> Path:
    """The prepared data folder of cfg's source, and the fused kernels it names, built once (what a
    run does first; a driver calls it before starting runs side by side). A bad source is a
    ConfigError, as in a run."""
    try:
        prepared = prepare_data(**vars(cfg.data), verbose=False)
    except DataError as e:
        raise ConfigError(str(e)) from None
    if "fused" in (cfg.model.norm_impl, cfg.model.ops_impl):
        kernel_available()
    return prepared


def describe(cfg: Config, device: str = "", dtype: str = "") -> dict:
    """What a run of cfg is, without building it: parameters, non-embedding ones (Kaplan et al.
    2020's N), training FLOPs per token, and the named GPU's dense peak FLOP/s in `dtype` (default
    cfg's; None for an unknown device)."""
    with torch.device("meta"):
        model = Llama(cfg.model)
    return {
        "parameters": model.num_params(),
        "non_embedding_parameters": model.num_params(non_embedding=True),
        "flops_per_token": flops_per_token(cfg.model, cfg.train.seq_len),
        "peak_flops": peak_flops(device, dtype or cfg.train.dtype) if device else None,
    }


@dataclass
class Data:
    tok: Tokenizer
    meta: dict
    loader: BatchLoader
    val_tokens: object
    token_bytes: torch.Tensor  # bytes of text each token id stands for (val/bpb)
    micro: int  # sequences per forward pass and process
    accum: int  # micro-batches per optimizer step


def inputs(cfg: Config, d: distributed.Dist) -> tuple[Data, dict]:
    """The job's layout, the batch split, this node's memory, the data, the kernels."""
    tc = cfg.train
    # before anything divides by the tensor-group count or shards
    check_layout(tc.parallel, d.world_size, tc.tp_size, cfg.model, tc.seq_len)
    d.data_rank, d.data_world = data_coords(d.rank, d.world_size, tc.parallel, tc.tp_size)
    micro, accum = split_batch(tc, d.data_world)
    cpu = tune_cpu(tc.threads, tc.malloc_tuning) if d.device.type == "cpu" else None
    # too big for this machine: refused before anything large is allocated (each rank its node)
    estimate = memory.check(cfg, d.world_size, d.data_world, micro, d.local_world, d.device)
    prepared = prepare_data(**vars(cfg.data), verbose=d.is_master)  # built once, cached
    shard = (d.data_rank, d.data_world)
    loader = BatchLoader(load_tokens(prepared, "train"), tc.seq_len, tc.batch_size, tc.seed, *shard)
    val_tokens = load_tokens(prepared, "val")
    eval_batches(val_tokens, tc.seq_len, micro, tc.eval_tokens)  # too few val tokens: fail now
    tok = Tokenizer(prepared / "tokenizer.model")
    # which fused kernels run and which paths fall back, loaded now rather than in the first step
    kernels = kernel_paths(d.device.type, cfg.model.norm_impl, cfg.model.ops_impl)
    kernels["attention"] = attention_path(cfg.model)
    token_bytes = torch.from_numpy(tok.token_bytes()).to(d.device)
    data = Data(tok, read_meta(prepared), loader, val_tokens, token_bytes, micro, accum)
    return data, {"kernels": kernels, "cpu": cpu, "memory": memory.describe(estimate)}
