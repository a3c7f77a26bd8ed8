"""Write the README's generated blocks and docs/results/README.md from the committed reports
(study/readme.py).

python scripts/readme_results.py            # README.md, docs/performance.md, docs/results/*.md
"""

import sys

from study.readme import main

if __name__ == "__main__":
    sys.exit(main())
