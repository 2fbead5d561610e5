"""python -m warpdeck.cli"""
import sys

from warpdeck.cli.main import main

sys.exit(main())
