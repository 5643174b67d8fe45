"""``python -m app.cli`` = the ``vllm-dyno`` console script."""
import sys

from app.cli import main

sys.exit(main())
