# /// script
# dependencies = ["a"]
# ///

print("between")

# /// script
# dependencies = ["b"]
# ///
