"""`python -m tools.cluster.image [--print | --unpack DIR]`: build, print or unpack the test images (images.main)."""

from __future__ import annotations

import sys

from tools.cluster.image.images import main

sys.exit(main(sys.argv[1:]))
