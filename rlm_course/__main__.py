import sys

from rlm_course.cli import main

sys.exit(main())
