# /// script
# dependencies = ["tomli; python_version < 3.11"]
# ///
