import sys

from sloserve.services.scheduler.main import main

sys.exit(main())
