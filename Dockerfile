# One image for the API, the score / curate worker and (with the trainer extra) the trainer.
FROM python:3.11-slim
ARG EXTRAS=""
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service service
COPY reward_models reward_models
COPY filters filters
COPY trainer trainer
COPY rollout rollout
COPY migrations migrations
RUN pip install --no-cache-dir -e ".${EXTRAS}"
ENV GRPO_CURATOR_HOST=0.0.0.0
EXPOSE 8000
CMD ["grpo-curator", "serve"]
