import sys

from cluster.report.page import main

sys.exit(main())
