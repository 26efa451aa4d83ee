import sys

from resmgr.app.cli import main

sys.exit(main())
