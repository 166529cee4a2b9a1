# /// script
# dependencies = ["a", 1]
# ///
