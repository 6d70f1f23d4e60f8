"""HookRegistry: cache the child registries instead of walking `named_modules()` on every `_set_context`.

`cache_context` calls `HookRegistry._set_context` twice per transformer call, and each call walks the whole module
tree. Upstream cached the list in 0.38.0 but never invalidated it (#14037: hooks registered after the first
`cache_context`, e.g. by `enable_cache`, were never reached, then "No context is set"). Here the cache is keyed on
a class-wide generation that every `register_hook` and `remove_hook` bumps, so it can never go stale.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import BLANK_LINE, EVERY, Example, Fix, FunctionRewrite, Rewrite, Upstream, as_method, parse_method

GENERATION = cst.parse_statement(
    "_registry_generation = 0  # bumped by register_hook/remove_hook; keys the child-registry caches\n"
)
BUMP = cst.parse_statement("HookRegistry._registry_generation += 1")
GET_CHILD_REGISTRIES = parse_method('''
def _get_child_registries(self) -> list["HookRegistry"]:
    """Registries of the child modules, cached until a hook is registered or removed anywhere.

    Walking `named_modules()` on every `_set_context` call costs milliseconds per call on large models. The cache
    is keyed on `HookRegistry._registry_generation`, so hooks added after it was built (e.g. by `enable_cache`)
    are still found.
    """
    cache = getattr(self, "_child_registries_cache", None)
    if cache is not None and cache[0] == HookRegistry._registry_generation:
        return cache[1]
    registries = []
    for module_name, module in unwrap_module(self._module_ref).named_modules():
        if module_name == "":
            continue
        module = unwrap_module(module)
        if hasattr(module, "_diffusers_hook"):
            registries.append(module._diffusers_hook)
    self._child_registries_cache = (HookRegistry._registry_generation, registries)
    return registries
''')
SET_CHILDREN = cst.parse_statement("""
for registry in self._get_child_registries():
    registry._set_context(name)
""")
# The tree walk in `_set_context`: `for module_name, module in unwrap_module(self._module_ref).named_modules():`
WALK = m.For(iter=m.Call(func=m.Attribute(attr=m.Name("named_modules"))))


class CachedChildRegistries(FunctionRewrite):
    DESCRIPTION = "HookRegistry._set_context iterates a cached, generation-checked list of child registries"
    FUNCTIONS = frozenset({"_set_context", "register_hook", "remove_hook"})

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        return frozenset({node.name.value})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        # Only HookRegistry: ModelHook also has a `_set_context`, which stays as it is.
        return node.name.value == "HookRegistry"

    def leave_FunctionDef(self, original_node, updated_node):
        name = original_node.name.value
        if name in self.FUNCTIONS and self.inside_target():
            body = list(updated_node.body.body)
            if name == "_set_context":
                walks = [i for i, s in enumerate(body) if m.matches(s, WALK)]
                if len(walks) == 1:
                    body[walks[0]] = SET_CHILDREN.with_changes(leading_lines=body[walks[0]].leading_lines)
                    self.edited(name)
            elif name == "register_hook":
                body.append(BUMP)
                self.edited(name)
            elif name == "remove_hook":
                first = body[0]
                if m.matches(first, m.If(test=m.Comparison(comparisons=[m.ComparisonTarget(operator=m.In())]))):
                    inner = list(first.body.body) + [BUMP]
                    body[0] = first.with_changes(body=first.body.with_changes(body=inner))
                    self.edited(name)
            updated_node = updated_node.with_changes(body=updated_node.body.with_changes(body=body))
        return super().leave_FunctionDef(original_node, updated_node)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != "HookRegistry":
            return updated_node
        body = list(updated_node.body.body)
        index = next((i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == "_set_context"), None)
        if index is None:
            self.warn("`HookRegistry` has no `_set_context`; left unchanged.")
            self._refused = True
            return updated_node
        body.insert(index + 1, GET_CHILD_REGISTRIES)
        body[0] = body[0].with_changes(leading_lines=[BLANK_LINE, *body[0].leading_lines])
        body.insert(0, GENERATION)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

HOOKS = """
class ModelHook:
    def _set_context(self, module, name):
        for attr in dir(self):
            pass


class HookRegistry:
    def register_hook(self, hook, name):
        self.hooks[name] = hook

    def remove_hook(self, name, recurse=True):
        if name in self.hooks.keys():
            del self.hooks[name]

    def _set_context(self, name=None):
        for hook_name in reversed(self._hook_order):
            hook = self.hooks[hook_name]

        for module_name, module in unwrap_module(self._module_ref).named_modules():
            if hasattr(module, "_diffusers_hook"):
                module._diffusers_hook._set_context(name)

    def __repr__(self):
        return ""
"""
# `ModelHook._set_context` is left alone
HOOKS_FIXED = """
class ModelHook:
    def _set_context(self, module, name):
        for attr in dir(self):
            pass


class HookRegistry:
    _registry_generation = 0  # bumped by register_hook/remove_hook; keys the child-registry caches

    def register_hook(self, hook, name):
        self.hooks[name] = hook
        HookRegistry._registry_generation += 1

    def remove_hook(self, name, recurse=True):
        if name in self.hooks.keys():
            del self.hooks[name]
            HookRegistry._registry_generation += 1

    def _set_context(self, name=None):
        for hook_name in reversed(self._hook_order):
            hook = self.hooks[hook_name]

        for registry in self._get_child_registries():
            registry._set_context(name)

""" + as_method(GET_CHILD_REGISTRIES) + """
    def __repr__(self):
        return ""
"""
EXAMPLES = (
    Example("rewritten_and_model_hook_untouched", HOOKS, HOOKS_FIXED),
    Example("warns_when_set_context_does_not_walk",
            HOOKS.replace("        for module_name, module in unwrap_module(self._module_ref).named_modules():\n"
                          "            if hasattr(module, \"_diffusers_hook\"):\n"
                          "                module._diffusers_hook._set_context(name)\n", "        walk(self, name)\n"),
            warning="`_set_context` does not have the expected shape (missing edits: _set_context; unexpected: none); "
                    "left unchanged."),
    Example("no_registry_class_is_a_no_op", HOOKS.split("class HookRegistry")[0]),
)


FIX = Fix(
    name="hook_registry_cache",
    description="HookRegistry._set_context uses a cached child-registry list, invalidated on hook (un)registration.",
    upstream=Upstream(
        refs=("#13356", "#14037", "#14093"),
        note="cache in 0.38.0 (stale-cache bug #14037), fixed and refactored to _set_cache_context in 0.41.0",
    ),
    rewrites=(
        Rewrite(
            module="diffusers.hooks.hooks",
            targets=("HookRegistry._set_context", "HookRegistry.register_hook", "HookRegistry.remove_hook"),
            codemod=CachedChildRegistries,
            upstream_since="0.41.0",
            pipelines=EVERY,
        ),
    ),
    exercised_by=("HookRegistry._get_child_registries",),
    examples=EXAMPLES,
    tried_on="flux",
)
