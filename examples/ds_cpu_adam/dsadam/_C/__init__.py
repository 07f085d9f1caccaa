"""Prebuilt variants land here (DSADAM_BUILD=all at pip install), with build_info.json."""
