"""librdkafka's logging through Python logging (tierserve.ps.kafka_log), with librdkafka's
own error objects and log calls: lines rate-limited per facility, one failed connection is not
an outage, a lasting one is logged once each way."""

from __future__ import annotations

import logging
import time

import pytest

from tierserve.ps import kafka_log
from tierserve.ps.kafka_log import KafkaLog

kafka = pytest.importorskip("confluent_kafka")


def _refused():
    return kafka.KafkaError(kafka.KafkaError._TRANSPORT, "Connect to 127.0.0.1:1 failed")


def test_lines_of_a_facility_are_rate_limited_with_a_count(caplog):
    caplog.set_level(logging.DEBUG, logger="tierserve.kafka")
    log = KafkaLog("t", interval_s=0.2)
    for _ in range(50):  # what confluent-kafka calls for each librdkafka line
        log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "refused")
    log.log(logging.INFO, "%s [%s] %s", "JOIN", "rdkafka#consumer-1", "joining")
    time.sleep(0.25)  # the 0.2 s interval passing is the behaviour
    log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "refused")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["t: FAIL [rdkafka#consumer-1] refused",
                        "t: FAIL [rdkafka#consumer-1] refused (49 similar lines left out)"]  # fmt: skip
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == ["JOIN [rdkafka#consumer-1] joining"]


def test_one_failed_connection_is_no_outage_a_lasting_one_is_logged_once(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="tierserve.kafka")
    monkeypatch.setattr(kafka_log, "OUTAGE_AFTER_S", 0.1)
    log = KafkaLog("t")
    log.error(_refused())
    assert not log.down  # as while a broker starts
    time.sleep(0.15)  # the outage outlasting OUTAGE_AFTER_S is the behaviour
    for _ in range(20):
        log.error(_refused())
    assert log.down and log.outages == 1
    log.recovered()
    log.recovered()
    assert not log.down
    lines = [r.getMessage() for r in caplog.records if r.name == "tierserve.kafka"]
    assert len(lines) == 2 and "unreachable" in lines[0] and "reachable again" in lines[1]


def test_other_errors_are_logged_rate_limited(caplog):
    caplog.set_level(logging.INFO, logger="tierserve.kafka")
    log = KafkaLog("t")
    for _ in range(5):
        log.error(kafka.KafkaError(kafka.KafkaError.GROUP_AUTHORIZATION_FAILED, "denied"))
    assert not log.down
    assert len([r for r in caplog.records if "denied" in r.getMessage()]) == 1
