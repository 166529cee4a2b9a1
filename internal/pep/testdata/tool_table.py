#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""Module docstring first; the block may sit anywhere at top level."""
# /// script
# dependencies = ["httpx>=0.27"]
#
# [tool.uv]
# exclude-newer = "2024-06-01T00:00:00Z"
#
# [tool.some-other-tool]
# answer = 42
# ///

import httpx
