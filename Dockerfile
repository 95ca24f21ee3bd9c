# Image for docker-compose.yml: the platform and the guard library, installed as users
# install them (two wheels, not editable), with their dependencies. `bench` and `tests`
# are repository tools and stay out of the image.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY LICENSE README.md pyproject.toml ./
COPY jobs ./jobs
COPY resilience ./resilience
RUN pip install ./resilience '.[otel]' && rm -rf /src && useradd --create-home jobs
WORKDIR /home/jobs
USER jobs
CMD ["jobs", "--help"]
