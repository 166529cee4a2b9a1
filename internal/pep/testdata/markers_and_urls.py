# /// script
# requires-python = ">=3.9, <3.14"
# dependencies = [
#   "requests[socks,security] >= 2.31, == 2.*",
#   'tomli>=1.1 ; python_version < "3.11"',
#   "pkg @ https://example.com/pkg-1.0-py3-none-any.whl",
#   "pywin32; sys_platform == 'win32'",
# ]
# ///
