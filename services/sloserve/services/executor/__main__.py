import sys

from sloserve.services.executor.server import main

sys.exit(main())
