FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY streams ./streams
RUN pip install --no-cache-dir .
EXPOSE 6066
CMD ["confidence-streams", "worker"]
