"""python -m warpdeck.cli"""
import sys

from warpdeck.cli.entry import main

sys.exit(main())
