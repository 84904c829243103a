import sys

from sloserve.services.gateway.server import main

sys.exit(main())
