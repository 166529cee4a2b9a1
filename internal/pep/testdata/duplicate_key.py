# /// script
# dependencies = ["a"]
# dependencies = ["b"]
# ///
