# A script with comments but no metadata block.
# dependencies = ["requests"]
import sys

print(sys.version)
