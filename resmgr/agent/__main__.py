import sys

from resmgr.agent.main import main

sys.exit(main())
