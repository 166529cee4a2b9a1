# /// script
# requires-python = ">=3.9 <3.13"
# ///
