import sys

from sloserve.services.frontend.server import main

sys.exit(main())
