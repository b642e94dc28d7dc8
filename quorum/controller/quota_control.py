"""AlterClientQuotas (KIP-546) decided by the controller: each entry's
operations become `ClientQuotaRecord`s. Pure: request and working image in,
records and response out. An entry is applied whole or refused whole."""

from __future__ import annotations

from typing import Any

from kio.schema.alter_client_quotas.v1 import response as acq_resp
from kio.schema.errors import ErrorCode

from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.metadata.client_quotas import entity_of, entity_problem, value_problem
from quorum.metadata.image import MetadataImage
from quorum.metadata.records import ClientQuotaRecord, Record


class QuotaControlManager:
    def alter_client_quotas(self, request: Any, image: MetadataImage, _now_ms: int) -> ControllerResult[Any]:
        records: list[Record] = []
        results = []
        for entry in request.entries:
            entity = entity_of((e.entity_type, e.entity_name) for e in entry.entity)
            problem = entity_problem(entity)
            entry_records: list[Record] = []
            keys: set[str] = set()
            for op in entry.ops if problem is None else ():
                if op.key in keys:
                    problem = f"quota key {op.key!r} appears twice for one entity"
                    break
                keys.add(op.key)
                problem = value_problem(op.key, 1.0 if op.remove else float(op.value), entity)
                if problem is not None:
                    break
                entry_records.append(ClientQuotaRecord(entity, op.key, None if op.remove else float(op.value)))
            if problem is None:
                records += entry_records
            results.append(acq_resp.EntryData(
                error_code=ErrorCode.none if problem is None else ErrorCode.invalid_request,
                error_message=problem,
                entity=tuple(acq_resp.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                             for e in entry.entity)))
        return ControllerResult(() if request.validate_only else tuple(records),
                                acq_resp.AlterClientQuotasResponse(throttle_time=NO_THROTTLE, entries=tuple(results)))
