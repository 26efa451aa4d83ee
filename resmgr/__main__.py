import sys

from resmgr.cli import main

sys.exit(main())
