# /// script
# dependencies = "requests"
# ///
