import sys

from resmgr.webhook.main import main

sys.exit(main())
