import sys

from privaudit.cli.app import main

sys.exit(main())
