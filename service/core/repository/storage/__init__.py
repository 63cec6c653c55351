"""Cloud model repositories (s3://, gs://, as://): each is copied into a local folder that the repository code reads.

`mirror.py` keeps the copy in step with the bucket (a listing, then only the objects that changed); one module per
provider (`s3.py`, `gcs.py`, `azure.py`) lists and downloads; `location.py` parses the URLs and `credentials.py`
reads Triton's TRITON_CLOUD_CREDENTIAL_PATH file.
"""
