"""``python -m hybridflow.data.preprocess SCRIPT ...``: run one preprocess script by name."""

import sys

from hybridflow.data.preprocess import main

if __name__ == "__main__":
    sys.exit(main())
