# Image for docker-compose.yml: the platform's code with its dependencies.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md beat_schedule.py ./
COPY jobs ./jobs
COPY resilience ./resilience
COPY bench ./bench
RUN pip install '.[otel]' && useradd --create-home jobs
USER jobs
CMD ["jobs", "--help"]
