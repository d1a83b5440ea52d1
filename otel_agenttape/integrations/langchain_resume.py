"""Resume for LangChain and LangGraph: a chat model that returns recorded results and tools whose
committed side effects are not repeated.

    index = ResumeIndex("order-7", journal="agent.resume.sqlite")   # the same id when resuming
    model = resumable_chat_model(ChatOpenAI(model="gpt-4o"), index)
    tools = [resumable_tool(charge, index), resumable_tool(lookup, index)]
    agent = create_react_agent(model, tools)

A model call is keyed by the model's identifying parameters, the messages and the call's keyword
arguments (bound tools included); a hit returns the recorded ``ChatResult`` without calling the
wrapped model. Streamed calls are resumed whole (the recorded message, not token by token). A tool
call is keyed by its name and arguments, journaled before it runs (see ``ResumableToolExecutor``).
"""

from __future__ import annotations

from typing import Any

from otel_agenttape.resume import ResumableModelClient, ResumableToolExecutor, ResumeIndex

try:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import convert_to_openai_messages, message_to_dict, messages_from_dict
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import RunnableBinding
    from langchain_core.tools import BaseTool, StructuredTool
    from pydantic import ConfigDict
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError('LangChain is needed: pip install "otel-agenttape[langgraph]"') from exc

API = "langchain.chat"


def _encode(result: ChatResult) -> dict[str, Any]:
    return {"generations": [{"message": message_to_dict(g.message), "info": g.generation_info}
                            for g in result.generations], "llm_output": result.llm_output}


def _decode(value: dict[str, Any]) -> ChatResult:
    gens = []
    for g in value.get("generations") or []:
        message = messages_from_dict([g["message"]])[0]
        gens.append(ChatGeneration(message=message, generation_info=g.get("info")))
    return ChatResult(generations=gens, llm_output=value.get("llm_output"))


class ResumableChatModel(BaseChatModel):
    """A chat model in front of ``inner``: recorded calls come back from ``index``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseChatModel
    index: Any

    @property
    def _llm_type(self) -> str:
        return self.inner._llm_type

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return dict(self.inner._identifying_params)

    def _request(self, messages: list[Any], stop: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        # as OpenAI chat messages: the content, without the ids LangGraph gives messages on each run
        return {"$api": API, "model": self._identifying_params, "messages": convert_to_openai_messages(messages),
                "stop": stop, "kwargs": kwargs}

    def _client(self) -> ResumableModelClient:
        return ResumableModelClient(None, self.index, encode=_encode, decode=_decode)

    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        def call() -> ChatResult:
            return self.inner._generate(messages, stop=stop, **kwargs)

        return self._client().create(request, call=call)

    async def _agenerate(self, messages: list[Any], stop: Any = None, run_manager: Any = None,
                         **kwargs: Any) -> ChatResult:
        request = self._request(messages, stop, kwargs)
        return await self._client().acreate(request, call=lambda: self.inner._agenerate(messages, stop=stop, **kwargs))

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """Binds the tools the way the wrapped model does, to this wrapper."""
        bound = self.inner.bind_tools(tools, **kwargs)
        if isinstance(bound, RunnableBinding):
            return RunnableBinding(bound=self, kwargs=bound.kwargs, config=bound.config)
        return self


def resumable_chat_model(model: BaseChatModel, index: ResumeIndex) -> ResumableChatModel:
    """Wrap any LangChain chat model so completed calls are not paid for again on resume."""
    return ResumableChatModel(inner=model, index=index)


def resumable_tool(tool: BaseTool, index: ResumeIndex, *, in_doubt: str = "raise") -> StructuredTool:
    """A tool with ``tool``'s name, description and schema whose calls go through the journal.

    ``in_doubt`` decides what an interrupted call does on resume: ``"raise"`` (``InDoubtError``, the
    default) or ``"reexecute"``.
    """

    def func(**arguments: Any) -> Any:
        def run(**_: Any) -> Any:  # the wrapped tool runs without callbacks: the wrapper's are the record
            return tool.invoke(arguments, config={"callbacks": []})

        return ResumableToolExecutor({tool.name: run}, index, in_doubt=in_doubt).execute(tool.name, arguments)

    async def coroutine(**arguments: Any) -> Any:
        def run(**_: Any) -> Any:
            return tool.ainvoke(arguments, config={"callbacks": []})

        return await ResumableToolExecutor({tool.name: run}, index, in_doubt=in_doubt).aexecute(tool.name, arguments)

    return StructuredTool.from_function(func=func, coroutine=coroutine, name=tool.name,
                                        description=tool.description, args_schema=tool.args_schema)
