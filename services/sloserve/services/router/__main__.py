import sys

from sloserve.services.router.server import main

sys.exit(main())
