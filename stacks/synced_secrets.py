"""The Secrets Manager secrets the settings name, as External Secrets syncs them into the serving namespace."""

from __future__ import annotations

import serve_config
from cdk_constructs.gcs_store import GcsStore
from cdk_constructs.secrets_sync import SyncedSecret
from serve_config import endpoint_keys
from settings import Settings


def synced_secrets(settings: Settings, *, gcs_store: GcsStore | None = None) -> list[SyncedSecret]:
    """The Secrets Manager secrets the settings name, and the GCS store's AUTH token where the stack makes the
    store, as External Secrets syncs them into the serving namespace."""
    synced = []
    if gcs_store is not None:
        synced.append(
            SyncedSecret(
                construct_id="GcsStoreExternalSecret",
                secret_name=gcs_store.auth_token.secret_arn,
                target_secret=serve_config.GCS_STORE_SECRET,
                target_key=serve_config.GCS_STORE_SECRET_KEY,
                # ElastiCache's token changes only by a rotation the stack does not do.
                refresh_seconds=3600,
                kms_key_arn=gcs_store.key.key_arn,
            )
        )
    if settings.hf_token_secret_name is not None:
        synced.append(
            SyncedSecret(
                construct_id="ExternalSecret",
                secret_name=settings.hf_token_secret_name,
                target_secret=serve_config.HF_TOKEN_SECRET,
                target_key=serve_config.HF_TOKEN_SECRET_KEY,
                refresh_seconds=3600,
                kms_key_arn=settings.hf_token_kms_key_arn,
            )
        )
    if settings.endpoint_api_keys_secret_name is not None:
        synced.append(
            SyncedSecret(
                construct_id="ApiKeysExternalSecret",
                secret_name=settings.endpoint_api_keys_secret_name,
                target_secret=endpoint_keys.API_KEYS_SECRET,
                target_key=endpoint_keys.API_KEYS_FILE_KEY,
                refresh_seconds=settings.endpoint_api_keys_refresh_seconds,
                kms_key_arn=settings.endpoint_api_keys_kms_key_arn,
            )
        )
    return synced
