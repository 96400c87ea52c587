"""``python -m edgecap.train [OPTIONS]`` is ``edgecap train [OPTIONS]``; the module torchrun launches per rank:

    torchrun --nproc-per-node 4 -m edgecap.train --data flickr8k:DIR --out runs/sat
"""

import sys

from edgecap.cli import main

sys.argv[1:1] = ["train"]
main()
