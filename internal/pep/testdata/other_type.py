# /// pyproject
# [project]
# name = "ignored"
# ///

# /// script
# requires-python = "~=3.10"
# ///
print("other block types are ignored")
