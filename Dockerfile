# The gateway image (core install: no torch). Build with the semantic extra for the semantic cache:
#   docker build --build-arg EXTRAS="[otlp,semantic]" .
FROM python:3.11-slim
ARG EXTRAS="[otlp]"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY loadtests ./loadtests
COPY policies ./policies
COPY fallbacks ./fallbacks
RUN pip install --no-cache-dir ".${EXTRAS}"
ENV GATEWAY_HOST=0.0.0.0 GATEWAY_PORT=8080
EXPOSE 8080
CMD ["gateway", "serve"]
