"""Helper libraries the tests share: none of them is a test module."""
