import sys

from sloserve.services.scheduler.server import main

sys.exit(main())
