# ///script
# dependencies = ["a"]
# ///
# /// script 
# dependencies = ["b"]
# ///
# /// my_type
# dependencies = ["c"]
# ///
