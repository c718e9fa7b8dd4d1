"""The tool API (verl's ``BaseTool``): one tool object serves every rollout through instances.

Life of a tool in one trajectory::

    instance_id, _ = await tool.create(instance_id, **create_kwargs)   # per-sample state (e.g. ground truth)
    response, step_reward, metrics = await tool.execute(instance_id, parameters)   # once per call
    reward = await tool.calc_reward(instance_id)                       # at the end of the trajectory
    await tool.release(instance_id)

``create_kwargs`` come from the data row: ``extra_info.tools_kwargs[tool_name].create_kwargs``.
Every method may be a coroutine or a plain function: the agent loop runs each call in a thread
of its own with a deadline (:mod:`hybridflow.tools.bounded`), so a tool that blocks costs one
time-out, and one that raises or returns the wrong shape is an error message to the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from hybridflow.errors import ConfigError
from hybridflow.tools.bounded import ToolCallError


@dataclass
class ToolResponse:
    """What a tool call returns to the conversation (verl's fields): text, and for a vision-language policy images
    (PIL images, shown to the model before the text, in order). Videos are not supported (a call that returns one is
    an error to the model)."""

    text: str = ""
    image: list[Any] | None = None
    video: list[Any] | None = None


def validate_tool_schema(schema: Any, *, where: str) -> dict:
    """An OpenAI function schema ``{type: function, function: {name, description, parameters}}``."""
    if hasattr(schema, "items") and not isinstance(schema, dict):
        schema = dict(schema)
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or schema.get("type", "function") != "function" or not function.get("name"):
        raise ConfigError(
            f"{where}: tool_schema must be an OpenAI function schema like "
            "{type: function, function: {name: calculator, description: ..., parameters: {type: object, "
            f"properties: {{...}}, required: [...]}}}}; got {schema!r}")
    parameters = function.get("parameters")
    parameters = {"type": "object", "properties": {}} if parameters is None else parameters  # a tool without args
    problem = parameters_problem(parameters)
    if problem is not None:
        raise ConfigError(f"{where}: tool {function['name']!r} has tool_schema.function.parameters={parameters!r}, "
                          f"which is not a JSON schema of the arguments: {problem}; write {{type: object, properties: "
                          "{x: {type: number, description: ...}}, required: [x]}")
    return {"type": "function", "function": {**function, "parameters": parameters}}


def parameters_problem(parameters: Any) -> str | None:
    """Why ``parameters`` is not the object schema a function call's arguments need (the chat template shows it to
    the model, and the parser reads the arguments as an object), or None. Mappings and lists may be OmegaConf's."""
    if not hasattr(parameters, "items"):
        return f"it is a {type(parameters).__name__}, not a mapping"
    if parameters.get("type", "object") != "object":
        return f"its type is {parameters.get('type')!r}; the arguments are an object"
    properties = parameters.get("properties", {})
    if not hasattr(properties, "items") or not all(hasattr(p, "items") for p in properties.values()):
        return "properties must map each argument name to its schema"
    required = parameters.get("required", [])
    if isinstance(required, (str, bytes)) or not hasattr(required, "__iter__") or not all(
            name in properties for name in required):
        return f"required={required!r} must list argument names of properties"
    return None


class BaseTool:
    """A tool with no state: subclasses override ``execute`` and, when they keep per-trajectory
    state, ``create`` / ``calc_reward`` / ``release`` (see ``InstanceState``)."""

    default_schema: dict | None = None
    """The schema used when the tool config gives none."""

    def __init__(self, config: dict | None = None, tool_schema: dict | None = None):
        self.config = dict(config or {})
        schema = tool_schema or self.default_schema
        self.tool_schema = validate_tool_schema(schema, where=type(self).__name__)
        self.name: str = self.tool_schema["function"]["name"]

    def get_openai_tool_schema(self) -> dict:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or uuid4().hex, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        raise NotImplementedError(f"{type(self).__name__}.execute")

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        return None


def create_kwargs_of(kwargs: dict) -> dict:
    """verl passes per-sample arguments either flat or under ``create_kwargs``; accept both."""
    nested = kwargs.get("create_kwargs") or {}
    flat = {k: v for k, v in kwargs.items() if k != "create_kwargs"}
    return {**flat, **nested}


def reward_number(value: Any, *, what: str) -> float:
    """``value`` as a finite float (None is 0.0); :class:`ToolCallError` naming ``what`` otherwise."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ToolCallError(f"{what} returned the reward {value!r}, which is not a finite number")
    return float(value)


def execute_result(name: str, result: Any) -> tuple[str, list[Any], float]:
    """(text for the model, images for the model, step reward) from what ``execute`` returned;
    :class:`ToolCallError` when it is not ``(ToolResponse | str, reward, metrics)``, or returns videos."""
    if not isinstance(result, tuple) or len(result) != 3:
        raise ToolCallError(f"tool {name} execute() returned {type(result).__name__} {repr(result)[:80]}; it must "
                            "return (ToolResponse(text=...), step_reward: float, metrics: dict)")
    response, step_reward, _ = result
    text = response if isinstance(response, str) else getattr(response, "text", None)
    text = "" if text is None and getattr(response, "image", None) else text  # verl: an image alone, text None
    if not isinstance(text, str):
        raise ToolCallError(f"tool {name} execute() returned the response {response!r}; it must be a "
                            "ToolResponse(text=...) or a str")
    return text, response_images(name, response), reward_number(step_reward, what=f"tool {name} execute()")


def response_images(name: str, response: Any) -> list[Any]:
    """The images of a tool's response (``ToolResponse.image``: a list, verl's rule), None entries dropped."""
    if getattr(response, "video", None):
        raise ToolCallError(f"tool {name} returned a video; videos from tools are not supported: return its frames "
                            "as images (ToolResponse(image=[frame, ...]))")
    images = getattr(response, "image", None)
    if images is None:
        return []
    if not isinstance(images, list):
        raise ToolCallError(f"tool {name} returned image={type(images).__name__}; ToolResponse.image must be a list "
                            "(wrap one image: image=[img])")
    return [image for image in images if image is not None]
