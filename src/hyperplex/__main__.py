import sys

from hyperplex.cli import main

sys.exit(main())
