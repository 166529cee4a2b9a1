import os

# /// script
# requires-python = ">=3.9"
# dependencies = [
#   "requests"
#   "rich",
# ]
# ///
