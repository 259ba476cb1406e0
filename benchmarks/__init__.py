"""Side-by-side benchmark of dledger against etcd and PySyncObj (`make bench-compare`)."""
