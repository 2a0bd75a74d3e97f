from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from workers_app.actions.lifecycle import initial_deadline
from workers_app.models import Cluster, Environment, EnvironmentField, Worker


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


class ClusterFactory(factory.django.DjangoModelFactory):
    """A cluster row for tests that never open SSH to it."""

    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n}")
    host = "127.0.0.1"
    port = 2299
    username = "nobody"
    scheduler = "slurm"


class EnvironmentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Environment

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"env-{n}")
    partition = "debug"


class FieldFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = EnvironmentField

    environment = factory.SubFactory(EnvironmentFactory)
    name = "walltime"
    directive = "--time={value}"
    pattern = r"\d{1,2}:\d{2}:\d{2}"
    default = "01:00:00"


class WorkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Worker

    owner = factory.SubFactory(UserFactory)
    cluster = factory.SubFactory(ClusterFactory)
    environment = factory.SubFactory(EnvironmentFactory, cluster=factory.SelfAttribute("..cluster"))
    name = factory.Sequence(lambda n: f"worker-{n}")
    created_at = factory.LazyFunction(timezone.now)
    deadline_at = factory.LazyAttribute(lambda w: initial_deadline(w.created_at))
