# The example Spark streaming job of compose.yaml: PySpark (local mode) + Java 17.
FROM python:3.12-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SPARK_LOCAL_IP=127.0.0.1

WORKDIR /opt/ticktable
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY flight ./flight
COPY clients ./clients
COPY ticktable ./ticktable
COPY examples ./examples
RUN pip install ".[spark]" && useradd --system --uid 10001 --create-home ticktable
USER ticktable
ENV PYSPARK_PYTHON=/usr/local/bin/python
ENTRYPOINT ["python", "examples/spark_streaming.py"]
