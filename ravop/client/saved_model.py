"""What fetching a model saved by `ravdl.v2.Pytorch_Model.save_model` returns: a plain `torch.nn.Module`.

Its parameters and buffers are the trained values under the names the original module gave them, so
`state_dict()` loads straight into the user's own class (`MyNet().load_state_dict(fetched.state_dict())`),
the non-deprecated way to keep a model. Its forward runs the model's code, which came in as TorchScript;
that code object is held outside the module tree (its tensors are the ones registered here), and before
each call its slots are pointed at this module's current tensors, so `.to(device)`, `load_state_dict` and
`train()/eval()` act on what runs.
"""
import torch

from ..ops.torchscript import slot_owner


class SavedModel(torch.nn.Module):
    def __init__(self, code, params, buffers):
        """`code`: the model's ScriptModule; `params`, `buffers`: (slot names, tensor) pairs, a tied tensor
        under all of its slot names."""
        super().__init__()
        self._slots = []
        for slots, value in params:
            parameter = value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value)
            for slot in slots:
                owner, name = self._owner(slot)
                owner.register_parameter(name, parameter)
                self._slots.append(slot)
        for slots, value in buffers:
            for slot in slots:
                owner, name = self._owner(slot)
                owner.register_buffer(name, value)
                self._slots.append(slot)
        self.__dict__["_code"] = code  # not a submodule: its state is the tensors registered above

    def _owner(self, slot):
        """The plain container module that holds dotted `slot` ("conv1.weight"), created as needed."""
        *path, name = slot.split(".")
        owner = self
        for part in path:
            if part not in owner._modules:
                owner.add_module(part, torch.nn.Module())
            owner = owner._modules[part]
        return owner, name

    def forward(self, *args, **kwargs):
        tensors = dict(self.named_parameters(remove_duplicate=False))
        tensors.update(self.named_buffers(remove_duplicate=False))
        for slot in self._slots:
            setattr(*slot_owner(self._code, slot), tensors[slot])
        self._code.train(self.training)
        return self._code(*args, **kwargs)
