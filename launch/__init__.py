"""The launchers: `python -m launch.<name>` parses its flags and calls one library function.

Started that way (`sys.argv[0]` is "-m" while Python imports this package), the
process first re-runs itself with huge pages for its large host buffers
(`wnscale.host_memory`); a test importing a launcher is left as it is.
"""

import sys

if sys.argv[:1] == ["-m"]:
  from wnscale import host_memory

  host_memory.use_huge_pages()
