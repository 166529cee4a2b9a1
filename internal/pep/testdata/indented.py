def main():
    # /// script
    # dependencies = ["requests"]
    # ///
    pass
