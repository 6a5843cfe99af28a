import sys

from paradec.cli import main

sys.exit(main())
