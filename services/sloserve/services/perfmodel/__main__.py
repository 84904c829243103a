import sys

from sloserve.services.perfmodel.server import main

sys.exit(main())
