# /// script
# dependencies = [
#   "requests>=2",
#   "numpy>=",
# ]
# ///
