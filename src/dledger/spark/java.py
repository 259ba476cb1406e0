"""Whether Spark can start its JVM here, asked before starting it.

Without Java, PySpark's launcher prints "JAVA_HOME is not set" and PySpark then raises
[JAVA_GATEWAY_EXITED] "Java gateway process exited before sending its port number": true,
but it sends a new user looking at the wrong thing. What starts a session of our own
(`dledger audit`, `make demo`; `register(spark)` is handed a session whose JVM runs) asks here
first and says in one line what is missing and how to get it. Standard library only: it
must answer where pyspark's own start would fail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

INSTALL_HINT = "install a JDK 17, e.g. `apt install openjdk-17-jre-headless`"


def java_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why Spark would find no `java` here, or None when it would.

    Mirrors PySpark's launcher (bin/spark-class): JAVA_HOME, when set, is used as it is
    (even with `java` on PATH), else `java` on PATH."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME", "")
    if home:
        java = Path(home) / "bin" / "java"
        if java.is_file() and os.access(java, os.X_OK):
            return None
        return f"Spark needs Java 17: JAVA_HOME is {home}, which has no bin/java ({INSTALL_HINT}, " \
               "or point JAVA_HOME at one)"
    if shutil.which("java", path=env.get("PATH", os.defpath)) is not None:
        return None
    return f"Spark needs Java 17: no `java` on PATH and JAVA_HOME is not set ({INSTALL_HINT})"
