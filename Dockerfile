# One image for the API, the score / curate worker and (with the trainer extra) the trainer.
# The code verifier runs untrusted programs under bubblewrap (docs/sandbox.md): the image installs it
# and everything runs as the unprivileged user "curator", so the sandbox's uid maps to a non-root uid.
FROM python:3.11-slim
ARG EXTRAS=""
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 curator \
    && install -d -o curator -g curator /var/lib/grpo-curator
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service service
COPY reward_models reward_models
COPY filters filters
COPY trainer trainer
COPY rollout rollout
COPY migrations migrations
RUN pip install --no-cache-dir -e ".${EXTRAS}"
ENV GRPO_CURATOR_HOST=0.0.0.0 \
    GRPO_CURATOR_DATA_DIR=/var/lib/grpo-curator
USER curator
EXPOSE 8000
CMD ["grpo-curator", "serve"]
