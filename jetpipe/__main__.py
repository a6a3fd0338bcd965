import sys

from jetpipe.cli import main

sys.exit(main())
